"""Optional training behaviour beside prompt augmentation, each off unless a recipe key turns it on.

* `collapse`: the collapse guard (watches entropy, accuracy, truncation, repetition and evaluation; logs,
  checkpoints or stops), ProRL's optimizer reset at each reference sync, and the tensor helpers behind
  RLinf's mini-batch skip.
* `dynamic_sampling`: DAPO's dynamic sampling (train each round only on groups whose rewards differ).
"""
