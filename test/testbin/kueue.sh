#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) at the version go.mod requires, about 6
# minutes cold on 2 cores; see manager.sh. Prints the directory that holds it on its last line.
exec bash "$(dirname "${BASH_SOURCE[0]}")/manager.sh" kueue sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue
