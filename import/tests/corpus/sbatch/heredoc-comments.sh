#!/bin/bash
# A comment among the directives does not end them.
#SBATCH --job-name="post process"   # trailing comment

#SBATCH --time=10:30   # MM:SS
# SBATCH --mem=1G   <- not a directive: a space after the #
  #SBATCH --mem=2G  <- not a directive: indented
#SBATCH --mem=3G
cat > config.ini <<'CONFIG'
#SBATCH --time=99:00:00
[run]
steps = 10
CONFIG
#SBATCH --nodes=8
python3 post.py config.ini
