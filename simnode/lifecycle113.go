package main

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Talos 1.13 added the ImageService and the LifecycleService (talos@v1.13.0:api/machine/image.proto,
// lifecycle.proto). A node that runs an older release has neither: gRPC answers Unimplemented for a service the
// server does not register, as a real 1.12 machined does. talosctl 1.13 checks the version first
// (talosUpgradeAPIVersionRange ">1.13.0-alpha.2 <2.0.0", cmd/talosctl/cmd/talos/upgrade.go:85,115-126) and falls
// back to the legacy MachineService.Upgrade on older nodes.

// lifecycleAPI is the first release with the ImageService and the LifecycleService.
var lifecycleAPI = semver.MustParse("1.13.0")

// hasLifecycleAPI says whether a node running tag serves the 1.13 services (a tag that does not parse: no).
func hasLifecycleAPI(tag string) bool {
	v, err := semver.ParseTolerant(tag)
	if err != nil {
		return false
	}

	v.Pre = nil // a 1.13 pre-release counts as 1.13 here; talosctl's own range starts after 1.13.0-alpha.2

	return v.GTE(lifecycleAPI)
}

// registerLifecycleAPI registers the 1.13 services on a boot's server when its release has them.
func registerLifecycleAPI(srv *grpc.Server, n *simNode, tag string) {
	if !hasLifecycleAPI(tag) {
		return
	}

	machine.RegisterImageServiceServer(srv, &imageServer{node: n})
	machine.RegisterLifecycleServiceServer(srv, &lifecycleServer{node: n})
}

// imageServer is the ImageService's Pull (talos@v1.13.0:internal/app/images/images.go:88-147).
type imageServer struct {
	machine.UnimplementedImageServiceServer

	node *simNode
}

// Pull "pulls" an installer image of the nodes file's "images" (or the resolver's): it takes the pull time, reports
// one layer done and answers the reference pinned to a digest, as machined does for a reference that is not
// canonical (:133-146). The digest is the SHA-256 of the reference (ours: simnode has no image contents). An image
// simnode does not know fails as one the registry does not have (:121-124, NotFound "error pulling image: ...").
func (s *imageServer) Pull(in *machine.ImageServicePullRequest, srv grpc.ServerStreamingServer[machine.ImageServicePullResponse]) error {
	ref := in.GetImageRef()
	if _, err := s.node.image(ref); err != nil {
		return status.Errorf(codes.NotFound, "error pulling image: %s", err)
	}

	if err := s.node.pause(srv.Context(), s.node.duration(s.node.spec.PullMS, installerPull)); err != nil {
		return err
	}

	digest := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(ref)))
	layer := &machine.ImageServicePullProgress{
		LayerId:  digest[7:19],
		Progress: &machine.ImageServicePullLayerProgress{Status: machine.ImageServicePullLayerProgress_EXTRACT_COMPLETE},
	}

	if err := srv.Send(&machine.ImageServicePullResponse{Response: &machine.ImageServicePullResponse_PullProgress{PullProgress: layer}}); err != nil {
		return err
	}

	s.node.pulled(ref)

	return srv.Send(&machine.ImageServicePullResponse{Response: &machine.ImageServicePullResponse_Name{Name: imageName(ref) + "@" + digest}})
}

// imageName is a reference without its tag (reference.ParseDockerRef(...).Name() for the references simnode knows).
func imageName(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}

	return ref
}

// lifecycleServer is the LifecycleService's Upgrade (talos@v1.13.0:internal/app/lifecycle/lifecycle.go:141-232):
// one install or upgrade at a time, the installer run from an image pulled before, its output streamed, then
// its exit code. It installs only: the node keeps running until something reboots it (talosctl calls Reboot
// next), and the next boot starts the installed image.
type lifecycleServer struct {
	machine.UnimplementedLifecycleServiceServer

	node *simNode
	lock sync.Mutex
}

func (s *lifecycleServer) Upgrade(in *machine.LifecycleServiceUpgradeRequest, srv grpc.ServerStreamingServer[machine.LifecycleServiceUpgradeResponse]) error {
	if !s.lock.TryLock() {
		return status.Error(codes.FailedPrecondition, "another installation/upgrade is already in progress")
	}
	defer s.lock.Unlock()

	ref := in.GetSource().GetImageName()
	if ref == "" {
		return status.Error(codes.InvalidArgument, "installer image name is required")
	}

	if !s.node.hasPulled(ref) { // container.go:94-97, wrapped at lifecycle.go:227-229
		return status.Error(codes.Internal, fmt.Sprintf("upgrade failed: installer image %q not found in containerd store: %s: not found", ref, ref))
	}

	img, err := s.node.image(ref)
	if err != nil {
		return status.Error(codes.Internal, fmt.Sprintf("upgrade failed: %v", err))
	}

	// The installer's output (container.go:222-240 streams it in chunks of up to 512 bytes); these lines are ours:
	// no source gives the installer's exact wording.
	for _, line := range []string{
		fmt.Sprintf("running Talos installer %s\n", img.TalosVersion),
		"installing the boot assets\n",
	} {
		msg := &machine.LifecycleServiceInstallProgress{Response: &machine.LifecycleServiceInstallProgress_Message{Message: line}}
		if err = srv.Send(&machine.LifecycleServiceUpgradeResponse{Progress: msg}); err != nil {
			return err
		}
	}

	if err = s.node.pause(srv.Context(), s.node.duration(s.node.spec.InstallMS, installDefault)); err != nil {
		return err
	}

	code := int32(0)
	if s.node.spec.FailInstall {
		// fail_install (faults.go failInstall; ours, no source for why an installer would fail): the installer
		// exits non-zero, the server streams its exit code and returns no error (talos@v1.13.0:
		// internal/app/lifecycle/container.go:212-221), nothing is installed for the next boot, and talosctl
		// prints "<node>: upgrade failed with exit code 1" and stops before its drain and reboot
		// (cmd/talosctl/cmd/talos/upgrade.go:136-139,216-224).
		code = 1
		s.node.logMachined(lifecycleUpgradeFailedLog(code)...)
	} else {
		s.node.installNext(ref)
	}

	exit := &machine.LifecycleServiceInstallProgress{Response: &machine.LifecycleServiceInstallProgress_ExitCode{ExitCode: code}}

	return srv.Send(&machine.LifecycleServiceUpgradeResponse{Progress: exit})
}

// pulled records an image in the node's containerd store (it outlives reboots: the store is on disk).
func (n *simNode) pulled(ref string) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if n.pulls == nil {
		n.pulls = map[string]struct{}{}
	}

	n.pulls[ref] = struct{}{}
}

func (n *simNode) hasPulled(ref string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()

	_, ok := n.pulls[ref]

	return ok
}

// installNext makes ref the image the next boot starts; the running one is what a failed boot returns to.
func (n *simNode) installNext(ref string) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.boot.next = ref
	n.boot.installed, n.boot.installedArgs, n.boot.installedExts = true, nil, nil // no extraKernelArgs through this API (cmdline.go bootArgs)
}
