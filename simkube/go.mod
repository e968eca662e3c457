module github.com/talos-gpu-runbooks/simkube

go 1.25.0
