package main

import (
	"fmt"
	"log"
	"strings"

	"github.com/google/go-cmp/cmp"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Talos 1.7 and 1.8 nodes: where those releases' machined answers the runbook's calls differently from 1.9's, the
// difference is made here (each cited at its tag). Checked and found the same as 1.9 for both: Version,
// ServiceList, Logs, Events, Reboot, Kubeconfig (talos@v1.7.0 and v1.8.0:internal/app/machined/internal/server/
// v1alpha1/v1alpha1_server.go, identical functions), the ExtensionStatus, KernelModuleSpec, Service, MachineConfig
// and Nodename resources (pkg/machinery/resources/..., unchanged to v1.9.0; PlatformMetadata gained two fields in
// 1.9 that simnode never sets), the upgrade handler but for preserve (below), and talosctl's tracker
// (cmd/talosctl/pkg/talos/action/tracker.go: v1.9.0 adds only the "(unauthorized)" boot ID fallback). As 1.9-1.11,
// MachineConfig's spec is the config document (legacy.go) and `modules` is KernelModuleSpec's alias.

// wipesEphemeral: an upgrade without --preserve to an installer before 1.8 re-creates the system disk's partitions.
// Every machined passes install.WithForce(!in.GetPreserve()) to the installer of the new image (talos@v1.7.0 and
// v1.8.0:internal/pkg/install/install.go:288-293, v1.12.0:272; a staged upgrade serializes the same options,
// v1.7.0 v1alpha1_server.go:499). With Force a 1.7 installer resets the partition table and re-creates EPHEMERAL
// with no filesystem, while BOOT, META and STATE keep their contents (talos@v1.7.0:cmd/installer/pkg/install/
// install.go:218,246, manifest.go:119,132-169), so the next boot formats a new, empty /var: pods' data, local
// volumes, anything under /var is gone; the config (STATE) is kept. The 1.8 installer ignores Force on upgrade
// ("system disk wipe on upgrade is not supported anymore, option ignored", talos@v1.8.0:cmd/installer/pkg/install/
// install.go:213-215; hack/release.toml:224-225), and talosctl 1.8 hides --preserve (cmd/talosctl/cmd/talos/
// upgrade.go:168). So it is the installer's release that decides, not the running node's.
func wipesEphemeral(installerTag string, preserve bool) bool {
	return !preserve && !atLeast(installerTag, 1, 8)
}

// ephemeralMount is where EPHEMERAL is mounted (constants.EphemeralMountPoint, talos@v1.7.0:pkg/machinery/
// constants/constants.go).
const ephemeralMount = "/var/"

// upgradePhasesOf are the upgrade sequence's phases for a node of release tag, as upgradePhases (one task per
// phase: the second task of "unmount" and "unmountSystem" is not published here either). Before 1.8 "unmountUser"
// (unmountUserDisks) follows "stopServices" (talos@v1.7.0 v1alpha1_sequencer.go:492, v1.5.5:498, v1.4.8:521): a
// failed install names its phase number counting it.
// Before 1.8 preserve chose the cleanup task (removeAllPods without it: pods stopped and removed; stopAllPods
// with it), a control-plane node left etcd without it, and "verifyDisk" ran where 1.8 runs "volumeFinalize"
// (talos@v1.7.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go:462-521, task names from
// v1alpha1_sequencer_tasks.go:1357-1421,1716); 1.8's is 1.9's (talos@v1.8.0, same file: identical function).
func upgradePhasesOf(tag string, preserve, controlPlane bool) [][2]string {
	if atLeast(tag, 1, 8) {
		return upgradePhases
	}

	cleanup := "stopAllPods"
	if !preserve {
		cleanup = "removeAllPods"
	}

	phases := [][2]string{{"drain", "cordonAndDrainNode"}, {"cleanup", cleanup}, {"dbus", "stopDBus"}}
	if !preserve && controlPlane {
		phases = append(phases, [2]string{"leave", "leaveEtcd"})
	}

	phases = append(phases, [][2]string{
		{"stopServices", "stopServicesForUpgrade"}, {"unmountUser", "unmountUserDisks"}, {"unmount", "unmountPodMounts"},
		{"unmountBind", "unmountSystemDiskBindMounts"}, {"unmountSystem", "unmountEphemeralPartition"},
		{"verifyDisk", "verifyDiskAvailability"}, {"upgrade", "upgrade"},
	}...)

	return append(phases, kexecPhasesOf(tag)...)
}

// kexecPhasesOf are the upgrade's phases after "upgrade": "meta" (reloadMeta) from 1.4, then "kexec", which
// before 1.5 mounts the boot partition around it ("mountBoot", "unmountBoot": talos@v1.4.8 v1alpha1_sequencer.go
// Upgrade :492-563, removed at v1.5.5; v1.3.7's Upgrade from :426 has no "meta" phase). Task names from
// v1alpha1_sequencer_tasks.go at those tags (mountBootPartition, kexecPrepare, unmountBootPartition, reloadMeta).
func kexecPhasesOf(tag string) [][2]string {
	kexec := [][2]string{{"kexec", "kexecPrepare"}}
	if !atLeast(tag, 1, 5) {
		kexec = [][2]string{{"mountBoot", "mountBootPartition"}, {"kexec", "kexecPrepare"}, {"unmountBoot", "unmountBootPartition"}}
	}

	if !atLeast(tag, 1, 4) {
		return kexec
	}

	return append([][2]string{{"meta", "reloadMeta"}}, kexec...)
}

// bootPhases is the number of the metal boot sequence's phase startEverything, which a failed boot names
// ("error running phase N in boot sequence"): Sequencer.Boot's phases on metal at each tag (v1alpha1_sequencer.go):
// 19 in 1.3 (udevSetup and udevd, which 1.4 moved to Initialize's earlyServices), 18 in 1.4 (validateConfig, which
// 1.5 drops, where 1.5 has extendPCRStartAll; talos@v1.3.7:167-258, v1.4.8:217-300, where labelControlPlane, uncordon
// and bootloader follow startEverything),
// 18 in 1.5 (containerd after env, legacyCleanup after overlay: talos@v1.5.5 :210-281), 16 in 1.6 and 1.7
// (saveStateEncryptionConfig ... lvm, extendPCRStartAll, startEverything), 15 in 1.8 and 1.9 (no lvm), 10 in 1.10
// (no mountState, saveConfig, var, overlay, extendPCRStartAll), 9 from 1.11 (no saveStateEncryptionConfig).
func bootPhases(tag string) int {
	switch {
	case !atLeast(tag, 1, 4):
		return 19
	case !atLeast(tag, 1, 6):
		return 18
	case !atLeast(tag, 1, 8):
		return 16
	case !atLeast(tag, 1, 10):
		return 15
	case !atLeast(tag, 1, 11):
		return 10
	default:
		return 9
	}
}

// missingFile is MachineService.Read's error for a path that does not exist: machined stats it first; from 1.8 a
// missing path is NotFound, 1.7 returns os.Stat's error as is, which gRPC sends as Unknown
// (talos@v1.7.0 and v1.8.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go Read).
func missingFile(tag, path string) error {
	msg := fmt.Sprintf("stat %s: no such file or directory", path)
	if !atLeast(tag, 1, 8) {
		return status.Error(codes.Unknown, msg)
	}

	return status.Error(codes.NotFound, msg)
}

// hasRuntimeValidate: ApplyConfiguration runs the config's RuntimeValidate from 1.9 (talos@v1.9.0
// v1alpha1_server.go ApplyConfiguration; absent at v1.8.0 and v1.7.0).
func hasRuntimeValidate(tag string) bool { return atLeast(tag, 1, 9) }

// dryRunDiff is what follows the dry-run summary's "(skipped in dry-run).\n": from 1.8 generateDiff's "Config
// diff:\n\n" and configdiff.DiffToString (talos@v1.8.0 v1alpha1_server.go:299-310); in 1.7 "Config diff:\n" and
// go-cmp's report of the two v1alpha1 structs (talos@v1.7.0 v1alpha1_server.go:221-240, cmp.Diff with
// AllowUnexported(InstallDiskSizeMatcher)). go-cmp's report is its own pseudo-Go, deliberately unstable: each
// process picks regular or non-breaking spaces at random (go-cmp cmp/report_text.go randBool), as a real 1.7
// machined does; its "... // N identical fields" counts are machinery v1.14.1's struct's, not 1.7's.
func dryRunDiff(tag string, current, next config.Provider) (string, error) {
	if !atLeast(tag, 1, 8) {
		diff := structDiff(current.RawV1Alpha1(), next.RawV1Alpha1())
		if diff == "" {
			diff = "No changes."
		}

		return "Config diff:\n" + diff, nil
	}

	diff, err := configDiff(tag, current, next)
	if err != nil {
		return "", fmt.Errorf("failed to generate diff: %w", err)
	}

	if diff == "" {
		diff = "No changes."
	}

	return "Config diff:\n\n" + diff, nil
}

// structDiff is 1.7's cmp.Diff of two v1alpha1 configs (see dryRunDiff).
func structDiff(current, next *v1alpha1.Config) string {
	return cmp.Diff(current, next, cmp.AllowUnexported(v1alpha1.InstallDiskSizeMatcher{}))
}

// immediateError is CanApplyImmediate's refusal: 1.7 prints go-cmp's report after "diff: " (talos@v1.7.0
// internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go:186-190), 1.8 on configdiff's after "diff:\n".
func immediateError(tag string, current, next *v1alpha1.Config, diff func() (string, error)) error {
	if !atLeast(tag, 1, 8) {
		return fmt.Errorf("this config change can't be applied in immediate mode\ndiff: %s", structDiff(current, next))
	}

	text, err := diff()
	if err != nil {
		return fmt.Errorf("error calculating diff: %w", err)
	}

	return fmt.Errorf("this config change can't be applied in immediate mode\ndiff:\n%s", text)
}

// hasPCIDevices: the PCIDevice resource (`talosctl get pcidevices`) is registered from 1.8 (talos@v1.8.0:internal/
// app/machined/pkg/runtime/v1alpha2/v1alpha2_state.go registers hardware.PCIDevice; v1.7.0's does not, and its
// pkg/machinery has no resources/hardware/pci_device.go). A 1.7 node's nodes-file "pci_devices" are not served.
func hasPCIDevices(tag string) bool { return atLeast(tag, 1, 8) }

// installImage is an upgrade's installer run: what GRUB boots next (install) and, for an installer before 1.8
// without preserve, a new empty EPHEMERAL (wipesEphemeral): the nodes file's files under /var are no longer
// read, from the next boot on and whichever image it boots (the partition table is not rolled back). The image
// was looked up when the call was made; an image that can no longer be looked up wipes nothing.
func (n *simNode) installImage(image string, preserve bool, exts []ExtensionSpec) {
	n.install(installArgs(n.activeConfig()), exts)

	img, err := n.image(image)
	if err != nil || !wipesEphemeral(img.TalosVersion, preserve) {
		return
	}

	n.mu.Lock()
	n.varWiped = true
	n.mu.Unlock()
	n.touch()
	log.Printf("%s: installer %s without preserve re-created EPHEMERAL: /var is empty from the next boot", n.spec.Address, img.TalosVersion)
}

// filesOnDisk is the nodes file's "files" as the node has them now: without those under /var once an upgrade wiped
// EPHEMERAL (what the observed file shows).
func (n *simNode) filesOnDisk() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()

	if !n.varWiped {
		return n.spec.Files
	}

	out := map[string]string{}

	for path, content := range n.spec.Files {
		if !strings.HasPrefix(path, ephemeralMount) {
			out[path] = content
		}
	}

	return out
}

// controlPlane: the node's active config is not a worker's (a 1.7 upgrade without preserve makes it leave etcd).
func (n *simNode) controlPlane() bool {
	cfg := n.activeConfig()

	return cfg != nil && cfg.Machine() != nil && cfg.Machine().Type().IsControlPlane()
}

// validationOptions: Validate checks the Kubernetes images' versions against the running Talos from 1.11
// (talos@v1.11.0:pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go ValidateKubernetesVersions; absent at
// v1.10.0 and before). simnode's pkg/machinery checks them against 1.14's range (Kubernetes 1.32 and later,
// compatibility/talos114), which refused the Kubernetes 1.30 and 1.31 configs of 1.7 and 1.8 nodes ("kubelet image
// is not valid: version of Kubernetes 1.30.0 is too old to be used with Talos 1.14.1"); before 1.11 the check is
// skipped, as those releases do. WithLocal skips only that check in pkg/machinery v1.14.1
// (v1alpha1_validation.go:351-354 and the Kubernetes documents' image checks).
func validationOptions(tag string) []validation.Option {
	if atLeast(tag, 1, 11) {
		return nil
	}

	return []validation.Option{validation.WithLocal()}
}
