#!/bin/bash
set -euo pipefail
echo "no directives: Meridian's defaults apply"
