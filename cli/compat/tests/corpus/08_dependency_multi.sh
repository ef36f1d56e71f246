#!/bin/bash
#SBATCH -d afterok:1001:1002,afterany:1003
#SBATCH --kill-on-invalid-dep=yes
#SBATCH -J merge

./merge.sh
