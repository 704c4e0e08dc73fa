#!/usr/bin/env bash
# Builds JobSet's manager (the root package of sigs.k8s.io/jobset) at the version go.mod
# requires, about 3 to 4 minutes cold on 2 cores; see manager.sh. Prints the directory that
# holds it on its last line.
exec bash "$(dirname "${BASH_SOURCE[0]}")/manager.sh" jobset sigs.k8s.io/jobset sigs.k8s.io/jobset
