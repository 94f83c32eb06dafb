"""Names the package and the `elmo` command share, in a module that imports nothing (`elmo` reads it without
importing the package): the model taken when none is named."""

DEFAULT_MODEL_NAME = "default"
