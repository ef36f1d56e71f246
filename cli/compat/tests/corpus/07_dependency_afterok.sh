#!/bin/bash
#SBATCH --dependency=afterok:4242
#SBATCH --job-name=postprocess
#SBATCH --time=1:00:00

python postprocess.py
