"""Text to token ids, free of torch and TorchTitan so data preparation starts in seconds."""
