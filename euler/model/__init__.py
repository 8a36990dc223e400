"""The model: its configuration, parameter layout, forward and backward, gradient check."""
