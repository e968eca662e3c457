package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"reflect"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// installedMetal is the validation mode of an installed bare-metal node: machined's modeWrapper over the
// metal platform mode with installed=true
// (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:160-168).
type installedMetal struct{}

func (installedMetal) String() string        { return "metal" }
func (installedMetal) RequiresInstall() bool { return false }
func (installedMetal) InContainer() bool     { return false }

// ApplyConfiguration follows machined's (same file, :173-330): Talos's loader (strict decoding) and
// validation, the mode's immediate-apply check, the dry-run summary with configdiff, then the change.
func (s *machineServer) ApplyConfiguration(ctx context.Context, in *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	if in.Mode != machine.ApplyConfigurationRequest_TRY {
		s.node.cancelTry()
	}

	cfg, warnings, err := s.validated(ctx, in.GetData())
	if err != nil {
		return nil, err
	}

	mode, modeDetails, modeErr, err := s.resolveMode(in, cfg)
	if err != nil {
		return nil, err
	}

	if in.DryRun {
		return s.dryRun(in.Mode, modeDetails, cfg)
	}

	log.Printf("%s: apply config request: mode %s", s.node.spec.Address, mode)

	if modeDetails, err = s.apply(ctx, in, cfg, modeDetails); err != nil {
		return nil, err
	}

	return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Mode: in.Mode, Warnings: warnings, ModeDetails: modeDetails + modeErr,
	}}}, nil
}

// validated decodes and validates a config as machined does (:182-211); every refusal is InvalidArgument.
func (s *machineServer) validated(ctx context.Context, data []byte) (config.Provider, []string, error) {
	if err := unregisteredKind(data, s.node.bootState().version); err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}

	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}

	if cfg.RawV1Alpha1() == nil {
		return nil, nil, status.Error(codes.InvalidArgument, "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?")
	}

	warnings, err := cfg.Validate(installedMetal{}, validationOptions(s.node.bootState().version)...)
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}

	var runtimeWarnings []string
	if hasRuntimeValidate(s.node.bootState().version) {
		if runtimeWarnings, err = cfg.RuntimeValidate(ctx, s.node.state, installedMetal{}); err != nil {
			return nil, nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}

	return cfg, s.releaseWarnings(slices.Concat(warnings, runtimeWarnings)), nil
}

// newIn114Warnings are the v1alpha1 validation warnings pkg/machinery v1.14.1 adds to v1.13's
// (config/types/v1alpha1/v1alpha1_validation.go:95-100 at v1.14.1; absent from the same file at v1.13.9). simnode
// validates with v1.14.1's machinery, but a node of an earlier release runs its own, which does not warn.
var newIn114Warnings = []string{
	".machine.files is deprecated; use dedicated configuration documents instead",
	".machine.baseRuntimeSpecOverrides is deprecated; use a CRIBaseRuntimeSpecConfig document instead",
}

// releaseWarnings drops the warnings the node's release does not print.
func (s *machineServer) releaseWarnings(warnings []string) []string {
	if atLeast(s.node.bootState().version, 1, 14) {
		return warnings
	}

	return slices.DeleteFunc(warnings, func(w string) bool { return slices.Contains(newIn114Warnings, w) })
}

// resolveMode: try and no-reboot need an immediate-apply change, auto picks no-reboot when it is one (:213-240).
func (s *machineServer) resolveMode(in *machine.ApplyConfigurationRequest, cfg config.Provider) (string, string, string, error) {
	if atLeast(s.node.bootState().version, 1, 14) {
		return resolveMode114(in)
	}

	mode, modeDetails, modeErr := in.Mode.String(), "Applied configuration with a reboot", ""

	switch in.Mode { //nolint:exhaustive
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		if err := canApplyImmediate(s.node.bootState().version, s.node.activeConfig(), cfg); err != nil {
			return "", "", "", status.Error(codes.InvalidArgument, err.Error())
		}

		modeDetails = "Applied configuration without a reboot"
	case machine.ApplyConfigurationRequest_STAGED:
		modeDetails = "Staged configuration to be applied after the next reboot"
	case machine.ApplyConfigurationRequest_AUTO:
		if err := canApplyImmediate(s.node.bootState().version, s.node.activeConfig(), cfg); err != nil {
			in.Mode = machine.ApplyConfigurationRequest_REBOOT
			modeErr = ": " + err.Error()
		} else {
			in.Mode = machine.ApplyConfigurationRequest_NO_REBOOT
			modeDetails = "Applied configuration without a reboot"
		}

		mode = fmt.Sprintf("%s(%s)", mode, in.Mode)
	}

	return mode, modeDetails, modeErr, nil
}

// resolveMode114 is Talos 1.14's: no mode reboots and none checks for an immediate apply; auto is no-reboot and
// reboot is refused (talos@v1.14.1:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:215-250).
func resolveMode114(in *machine.ApplyConfigurationRequest) (string, string, string, error) {
	mode := in.Mode.String()

	switch in.Mode { //nolint:exhaustive
	case machine.ApplyConfigurationRequest_REBOOT: //nolint:staticcheck // as machined, for older clients
		return "", "", "", status.Error(codes.Unimplemented, "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead")
	case machine.ApplyConfigurationRequest_AUTO:
		in.Mode = machine.ApplyConfigurationRequest_NO_REBOOT
		mode = fmt.Sprintf("%s(%s)", mode, in.Mode)

		return mode, "Applied configuration without a reboot", "", nil
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		return mode, "Applied configuration without a reboot", "", nil
	case machine.ApplyConfigurationRequest_STAGED:
		return mode, "Staged configuration to be applied after the next reboot", "", nil
	default:
		return "", "", "", status.Errorf(codes.InvalidArgument, "incorrect mode '%s' specified for the apply config call", in.Mode.String())
	}
}

// dryRun answers with the summary and the diff against the active config (:242-256, generateDiff :332-343).
func (s *machineServer) dryRun(mode machine.ApplyConfigurationRequest_Mode, modeDetails string, cfg config.Provider) (*machine.ApplyConfigurationResponse, error) {
	current := s.node.activeConfig()
	if current == nil {
		return nil, status.Error(codes.FailedPrecondition, "simnode: this node has no machine_config in the nodes file")
	}

	diff, err := dryRunDiff(s.node.bootState().version, current, cfg)
	if err != nil {
		return nil, err
	}

	return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Mode:        mode,
		ModeDetails: fmt.Sprintf("Dry run summary:\n%s (skipped in dry-run).\n%s", modeDetails, diff),
	}}}, nil
}

// apply changes the node (:258-317): try and no-reboot set the active config (try reverts after its timeout),
// staged keeps it for the next reboot, reboot keeps it and reboots the node.
func (s *machineServer) apply(ctx context.Context, in *machine.ApplyConfigurationRequest, cfg config.Provider, modeDetails string) (string, error) {
	switch in.Mode { //nolint:exhaustive
	case machine.ApplyConfigurationRequest_TRY:
		timeout := constants.ConfigTryTimeout
		if in.TryModeTimeout != nil {
			timeout = in.TryModeTimeout.AsDuration()
		}

		s.node.tryFor(timeout)

		return modeDetails + fmt.Sprintf("\nThe config is applied in 'try' mode and will be automatically reverted back in %s", timeout.String()), s.node.setActive(ctx, cfg)
	case machine.ApplyConfigurationRequest_NO_REBOOT:
		s.node.setPersisted(cfg)

		return modeDetails, s.node.setActive(ctx, cfg)
	case machine.ApplyConfigurationRequest_STAGED:
		s.node.setPersisted(cfg)

		return modeDetails, nil
	case machine.ApplyConfigurationRequest_REBOOT:
		s.node.setPersisted(cfg)
		go s.node.reboot()

		return modeDetails, nil
	default:
		return "", fmt.Errorf("incorrect mode '%s' specified for the apply config call", in.Mode.String())
	}
}

// canApplyImmediate is machined's Runtime.CanApplyImmediate
// (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go:119-206): the new config may
// differ from the active one only in the sections that apply without a reboot.
//
//nolint:staticcheck // the deprecated fields are compared as machined compares them
func canApplyImmediate(tag string, current, next config.Provider) error {
	if current == nil {
		return errors.New("no current config")
	}

	currentConfig := current.RawV1Alpha1()
	if currentConfig == nil {
		return errors.New("current config is not v1alpha1")
	}

	newConfig := next.RawV1Alpha1()
	if newConfig == nil {
		return errors.New("new config is not v1alpha1")
	}

	newConfig = newConfig.DeepCopy()
	newConfig.ConfigDebug = currentConfig.ConfigDebug
	newConfig.ClusterConfig = currentConfig.ClusterConfig

	if newConfig.MachineConfig != nil && currentConfig.MachineConfig != nil {
		nm, cm := newConfig.MachineConfig, currentConfig.MachineConfig
		nm.MachineCA, nm.MachineAcceptedCAs, nm.MachineTime = cm.MachineCA, cm.MachineAcceptedCAs, cm.MachineTime
		nm.MachineCertSANs, nm.MachineInstall, nm.MachineNetwork = cm.MachineCertSANs, cm.MachineInstall, cm.MachineNetwork
		nm.MachineSysfs, nm.MachineSysctls, nm.MachineLogging = cm.MachineSysfs, cm.MachineSysctls, cm.MachineLogging
		nm.MachineControlPlane, nm.MachineKubelet, nm.MachineKernel = cm.MachineControlPlane, cm.MachineKubelet, cm.MachineKernel
		nm.MachineRegistries, nm.MachinePods, nm.MachineSeccompProfiles = cm.MachineRegistries, cm.MachinePods, cm.MachineSeccompProfiles
		nm.MachineNodeAnnotations, nm.MachineNodeLabels, nm.MachineNodeTaints = cm.MachineNodeAnnotations, cm.MachineNodeLabels, cm.MachineNodeTaints

		if nm.MachineFeatures != nil && cm.MachineFeatures != nil {
			nf, cf := nm.MachineFeatures, cm.MachineFeatures
			nf.KubernetesTalosAPIAccessConfig, nf.KubePrismSupport = cf.KubernetesTalosAPIAccessConfig, cf.KubePrismSupport
			nf.HostDNSSupport, nf.ImageCacheSupport = cf.HostDNSSupport, cf.ImageCacheSupport
			nf.FeatureNodeAddressSortAlgorithm = cf.FeatureNodeAddressSortAlgorithm
		}
	}

	if !reflect.DeepEqual(currentConfig, newConfig) {
		return immediateError(tag, currentConfig, newConfig, func() (string, error) {
			return configDiff(tag, container.NewV1Alpha1(currentConfig), container.NewV1Alpha1(newConfig))
		})
	}

	return nil
}

// writeActive replaces the MachineConfig resource (ID v1alpha1) with cfg, creating it when absent.
func writeActive(ctx context.Context, n *simNode, cfg config.Provider) error {
	next := configres.NewMachineConfig(cfg)

	cur, err := safe.StateGetByID[*configres.MachineConfig](ctx, n.state, configres.ActiveID)
	if err != nil {
		return n.state.Create(ctx, next)
	}

	next.Metadata().SetVersion(cur.Metadata().Version())
	defer n.touch() // the observed file follows (observe.go)

	return n.state.Update(ctx, next)
}

// rebootDelay is how long a simulated reboot keeps the node's API down.
func (n *simNode) rebootDelay() time.Duration {
	return time.Duration(n.spec.RebootMS) * time.Millisecond
}
