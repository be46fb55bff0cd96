"""The local backend: the ranks run on this machine, sized to its CPUs, GPUs and memory."""
