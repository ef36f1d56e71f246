#!/bin/bash
#SBATCH --nodes=2
#SBATCH --time=01:00:00
#SBATCH --mail-type=END
#LATTICE --checkpoint=signal
#LATTICE --data-mount=s3://datasets/imagenet:/data
#LATTICE nodes=4

srun python train.py --data /data
