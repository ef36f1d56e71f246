#!/usr/bin/env python3
#SBATCH --job-name=pyjob
#SBATCH --time=15
#SBATCH --nodes=1
import os
print(os.environ.get("SLURM_JOB_ID"))
