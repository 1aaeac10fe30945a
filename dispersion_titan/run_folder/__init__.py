"""A run's folder read and written offline (one process, no process group), and the folders commands write."""
