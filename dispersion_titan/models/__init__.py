"""Model families registered into TorchTitan."""
