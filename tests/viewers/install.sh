#!/usr/bin/env bash
# The web viewers tests/test_viewers.py opens layerscope's exports in, installed from npm
# exactly as package-lock.json pins them (speedscope 1.25.0, whose web app is
# node_modules/speedscope/dist/release), into tests/viewers/node_modules (git-ignored).
# Needs node and npm (Debian: apt-get install npm). No package script runs.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --ignore-scripts --no-audit --no-fund
