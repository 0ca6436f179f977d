"""Where models go: the memory each needs (graftzoo plan), their placement on devices, and building the models and their engines from a pair's specs."""
