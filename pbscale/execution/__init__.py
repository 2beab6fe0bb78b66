"""How a run executes, a strategy outside the method (which never knows): split over torchrun
ranks (:mod:`.distributed`: its samples, or its minibatches), its supermask step replayed from a
CUDA graph (:mod:`.captured`), or trained as a member of a group of G runs in one process
(:mod:`.group`). Each is chosen from the family's capabilities (``caps.split_samples``,
``caps.captures_step``) by the tool that assembles the run."""
