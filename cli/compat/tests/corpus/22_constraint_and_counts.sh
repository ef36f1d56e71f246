#!/bin/bash
#SBATCH -C "gpu*2&ib"
#SBATCH -N 2
#SBATCH -t 20

srun ./ib_bench
