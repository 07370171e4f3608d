"""The model gateway: every request a cell makes to the model passes through us."""
