"""The error a user's own input causes: reported in one line by the CLI (train_ppo_ray.main), exit status 2."""


class UserInputError(ValueError):
    """A path or file the user gave is missing or unusable: reported in one line, exit status 2."""
