#!/bin/bash
#SBATCH --job-name=nightly
#SBATCH --mail-type=BEGIN,END,FAIL
#SBATCH --mail-user=alice@example.org
#SBATCH --time=02:00:00
#SBATCH --nodes=2

srun ./nightly_check
