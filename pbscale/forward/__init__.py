"""How k masks of a network are evaluated at once: the backends' contract (:mod:`.layout`) and
the MLP paths with their one plan interpreter (:mod:`.mlp`)."""
