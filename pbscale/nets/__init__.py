"""The networks and data a run trains on: :mod:`.models` (LeNet-300-100, Conv6, ResNet-20,
VGG-19), :mod:`.network` (a run's network: built-in or the user's import path, its masked
weights, its identity), :mod:`.data` (MNIST and CIFAR-10, splits, augmentation),
:mod:`.user_data` (the user's own arrays) and :mod:`.objectives` (cross-entropy, MSE or the
user's loss, per mask)."""
