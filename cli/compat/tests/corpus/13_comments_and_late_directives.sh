#!/bin/bash

# Resources ----------------------------------------
#SBATCH --nodes=8
# SBATCH --nodes=999     (disabled: space after #)
##SBATCH --time=99:00:00 (disabled: double hash)
   #SBATCH --qos=urgent  (indented: a comment)

#SBATCH --time=06:00:00
echo "starting"
#SBATCH --mem=1T
srun ./app
