#!/bin/bash
#SBATCH -N 2
#SBATCH -t 10

srun hostname
