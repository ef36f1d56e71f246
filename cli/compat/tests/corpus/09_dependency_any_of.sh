#!/bin/bash
#SBATCH --dependency=afterok:2001?afternotok:2002
#SBATCH --time=10

./notify.sh
