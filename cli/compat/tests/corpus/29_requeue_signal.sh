#!/bin/bash
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH -N 8
#SBATCH -t 24:00:00

trap 'touch checkpoint.flag' USR1
srun ./ckpt_app &
wait
