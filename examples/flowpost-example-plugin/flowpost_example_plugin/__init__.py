"""An example flowpost plugin: the ``contrast`` reward and the ``sharpness`` metric."""
