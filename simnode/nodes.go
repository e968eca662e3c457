package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/net"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// NodesFile is the JSON document simnode reads at start (-nodes): the Talos state of every simulated node.
//
// Field names are ours; the values are what the real resources and API replies carry, so they are named
// after the Talos field they fill (see README.md in this directory for the full schema).
type NodesFile struct {
	Nodes []NodeSpec `json:"nodes"`
	// Images maps an installer image reference (e.g. factory.talos.dev/metal-installer/<schematic>:v1.12.0) to
	// what a node booted from it runs: the Talos release and the extensions its schematic bakes in. A node
	// with "image" derives its extensions, modules and extension services from it (see derive.go).
	Images map[string]ImageSpec `json:"images,omitempty"`
}

// ImageSpec is what an installer image installs: the release and the system extensions (the schematic's).
type ImageSpec struct {
	TalosVersion string          `json:"talos_version"`
	Extensions   []ExtensionSpec `json:"extensions,omitempty"`
}

// NodeSpec is one simulated node.
type NodeSpec struct {
	Name         string          `json:"name"`
	Address      string          `json:"address"`
	TalosVersion string          `json:"talos_version"`
	Image        string          `json:"image,omitempty"` // installer ref of Images: derived node state
	InstallMS    int             `json:"install_ms,omitempty"`
	PullMS       int             `json:"pull_ms,omitempty"`
	SHA          string          `json:"sha,omitempty"`
	GoVersion    string          `json:"go_version,omitempty"`
	Down         string          `json:"down,omitempty"`
	LatencyMS    int             `json:"latency_ms,omitempty"`
	RebootMS     int             `json:"reboot_ms,omitempty"`
	Extensions   []ExtensionSpec `json:"extensions,omitempty"`
	// ConfigExtensions are what the last installer run added from machine.install.extensions (installext.go),
	// installed beside the image's: written to the observed file so a node resumes with them.
	ConfigExtensions []ExtensionSpec `json:"config_extensions,omitempty"`
	KernelModules    []ModuleSpec    `json:"kernel_modules,omitempty"`
	Services         []ServiceSpec   `json:"services,omitempty"`
	MachineConfig    string          `json:"machine_config,omitempty"`
	// PlatformMetadata is Talos's own spec type: its JSON keys are the YAML keys talosctl prints.
	PlatformMetadata *runtime.PlatformMetadataSpec `json:"platform_metadata,omitempty"`
	PCIDevices       []PCIDeviceSpec               `json:"pci_devices,omitempty"`
	// Files are what MachineService.Read returns, by absolute path (e.g. /proc/driver/nvidia/version).
	Files map[string]string `json:"files,omitempty"`
	// Faults of the simulated node (faults.go): extensions its images list otherwise, a GPU the driver cannot
	// initialise, an installer that fails.
	ExtensionFaults  []ExtensionFault `json:"extension_faults,omitempty"`
	NvidiaProbeFails bool             `json:"nvidia_probe_fails,omitempty"`
	FailInstall      bool             `json:"fail_install,omitempty"`
}

// PCIDeviceSpec is one PCIDevice, hardware namespace (talos@v1.12.0:pkg/machinery/resources/hardware/pcidevice.go):
// ID is the PCI address (0000:01:00.0), the names are what pcidb resolves for the IDs.
type PCIDeviceSpec struct {
	ID         string `json:"id"`
	Class      string `json:"class,omitempty"`
	Subclass   string `json:"subclass,omitempty"`
	Vendor     string `json:"vendor,omitempty"`
	Product    string `json:"product,omitempty"`
	ClassID    string `json:"class_id"`
	SubclassID string `json:"subclass_id"`
	VendorID   string `json:"vendor_id"`
	ProductID  string `json:"product_id"`
	Driver     string `json:"driver,omitempty"`
}

// ExtensionSpec is one ExtensionStatus (talos@v1.12.0:pkg/machinery/extensions/config.go Layer and metadata.go Metadata).
type ExtensionSpec struct {
	Image         string `json:"image,omitempty"`
	Name          string `json:"name"`
	Version       string `json:"version"`
	Author        string `json:"author,omitempty"`
	Description   string `json:"description,omitempty"`
	Compatibility string `json:"compatibility,omitempty"`
}

// ModuleSpec is one LoadedKernelModule (talos@v1.12.0:pkg/machinery/resources/runtime/loaded_kernel_module.go).
type ModuleSpec struct {
	Name           string   `json:"name"`
	Size           int      `json:"size,omitempty"`
	ReferenceCount int      `json:"reference_count,omitempty"`
	Dependencies   []string `json:"dependencies,omitempty"`
	State          string   `json:"state,omitempty"`
	Address        string   `json:"address,omitempty"`
}

// ServiceSpec is one entry of MachineService.ServiceList (talos@v1.12.0:api/machine/machine.proto ServiceInfo).
type ServiceSpec struct {
	ID          string      `json:"id"`
	State       string      `json:"state"`
	Healthy     *bool       `json:"healthy,omitempty"`
	LastMessage string      `json:"last_message,omitempty"`
	Events      []EventSpec `json:"events,omitempty"`
}

// EventSpec is one service event.
type EventSpec struct {
	Msg   string    `json:"msg"`
	State string    `json:"state"`
	Ts    time.Time `json:"ts"`
}

// Ways a node can be down, each failing the dial the way the kernel reports it to apid's backend.
var downKinds = map[string]string{
	"connection-refused": "apid not listening on a running host",
	"no-route-to-host":   "host powered off or unreachable on the network",
}

// Service states a ServiceRunner reports (talos@v1.12.0:internal/app/machined/pkg/system/events/events.go).
var serviceStates = []string{"Initialized", "Preparing", "Waiting", "Running", "Stopping", "Finished", "Failed", "Skipped", "Starting"}

// loadNodes reads and validates the nodes file: every problem names the node and the field, and what is valid.
func loadNodes(path string) (*NodesFile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-nodes %s: %w", path, err)
	}

	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()

	var nf NodesFile
	if err = dec.Decode(&nf); err != nil {
		return nil, fmt.Errorf("-nodes %s: %w", path, err)
	}

	if len(nf.Nodes) == 0 {
		return nil, fmt.Errorf("-nodes %s: no nodes (need at least one entry in \"nodes\")", path)
	}

	seen := map[string]string{}

	for i := range nf.Nodes {
		if err = validateNode(&nf.Nodes[i], i, seen); err != nil {
			return nil, fmt.Errorf("-nodes %s: %w", path, err)
		}

		if err = validateImage(&nf.Nodes[i], i, nf.Images); err != nil {
			return nil, fmt.Errorf("-nodes %s: %w", path, err)
		}
	}

	return &nf, nil
}

func validateNode(n *NodeSpec, i int, seen map[string]string) error {
	label := fmt.Sprintf("nodes[%d] (%s)", i, n.Name)

	switch {
	case n.Name == "":
		return fmt.Errorf("nodes[%d]: \"name\" is empty", i)
	case n.Address == "" || net.AddressContainsPort(n.Address):
		return fmt.Errorf("%s: \"address\" %q must be a host address without a port (apid dials it on port 50000)", label, n.Address)
	case !strings.HasPrefix(n.TalosVersion, "v"):
		return fmt.Errorf("%s: \"talos_version\" %q must be a Talos tag such as v1.12.0", label, n.TalosVersion)
	}

	if other, dup := seen[n.Address]; dup {
		return fmt.Errorf("%s: \"address\" %s is also the address of %s", label, n.Address, other)
	}

	seen[n.Address] = n.Name

	if n.LatencyMS < 0 || n.RebootMS < 0 || n.InstallMS < 0 || n.PullMS < 0 {
		return fmt.Errorf("%s: \"latency_ms\" (%d), \"reboot_ms\" (%d), \"install_ms\" (%d) and \"pull_ms\" (%d) must be 0 or more",
			label, n.LatencyMS, n.RebootMS, n.InstallMS, n.PullMS)
	}

	if _, ok := downKinds[n.Down]; n.Down != "" && !ok {
		return fmt.Errorf("%s: \"down\" %q is not one of %v", label, n.Down, sortedKeys(downKinds))
	}

	if err := validateFaults(n, label); err != nil {
		return err
	}

	for path := range n.Files {
		if !strings.HasPrefix(path, "/") {
			return fmt.Errorf("%s: \"files\" path %q must be absolute", label, path)
		}
	}

	for _, svc := range n.Services {
		if !contains(serviceStates, svc.State) {
			return fmt.Errorf("%s: service %q \"state\" %q is not one of %v", label, svc.ID, svc.State, serviceStates)
		}
	}

	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}

	return false
}

// validateImage: a node with "image" takes its release, extensions and modules from it, so the nodes file
// must not also list them (one truth), and the image must be one of "images".
func validateImage(n *NodeSpec, i int, images map[string]ImageSpec) error {
	if n.Image == "" {
		return nil
	}

	label := fmt.Sprintf("nodes[%d] (%s)", i, n.Name)

	img, ok := images[n.Image]

	switch {
	case !ok:
		return fmt.Errorf("%s: \"image\" %q is not one of \"images\" %v", label, n.Image, sortedKeys(images))
	case img.TalosVersion != n.TalosVersion:
		return fmt.Errorf("%s: \"talos_version\" %q differs from the image's %q (a node runs its image's release)", label, n.TalosVersion, img.TalosVersion)
	case len(n.Extensions) > 0 || len(n.KernelModules) > 0:
		return fmt.Errorf("%s: \"extensions\" and \"kernel_modules\" come from \"image\" and its machine config: remove them", label)
	}

	for _, svc := range n.Services {
		if strings.HasPrefix(svc.ID, "ext-") {
			return fmt.Errorf("%s: service %q comes from the image's extensions: remove it", label, svc.ID)
		}
	}

	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}

	slices.Sort(out)

	return out
}
