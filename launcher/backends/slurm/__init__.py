"""The Slurm backend: sbatch/srun/squeue/scontrol, following a job through the scheduler."""
