#!/bin/bash
#SBATCH --job-name=collect
#SBATCH --dependency=after:5100+10,afterok:5101_3,afterany:5102_7+2
#SBATCH --time=20

./collect.sh
