#!/bin/bash
#SBATCH     --nodes=4      # four nodes
#SBATCH	-t	2:00:00
#SBATCH -J   spaced-out   -o  out.txt   # name and output on one line
#SBATCH --partition=debug#no space before comment

srun hostname
