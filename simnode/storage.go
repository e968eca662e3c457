package main

import (
	"context"

	"github.com/siderolabs/talos/pkg/machinery/api/storage"
	"google.golang.org/protobuf/types/known/emptypb"
)

// storageServer is StorageService, which machined registers in every release simnode serves (talos@v1.3.7 and
// v1.13.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:153/:155). What talosctl calls of
// it: Disks, as the post check of talosctl 1.3's `upgrade --wait`, which counts the node upgraded once the call
// answers at all (talos@v1.3.5:cmd/talosctl/cmd/talos/upgrade.go:55-59; from 1.4 the post check compares boot
// IDs instead). The node's disks are not simulated (the runbook never reads them), so the list is empty where
// storaged lists the block devices (talos@v1.3.7:internal/app/storaged/server.go Disks).
type storageServer struct {
	storage.UnimplementedStorageServiceServer
}

func (storageServer) Disks(context.Context, *emptypb.Empty) (*storage.DisksResponse, error) {
	return &storage.DisksResponse{Messages: []*storage.Disks{{}}}, nil
}
