package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	yaml "go.yaml.in/yaml/v4"
)

// kindSince is the Talos minor release whose machinery first registers each config document kind: the
// `...Kind = "<kind>"` constants under pkg/machinery/config/types at the tags v1.5.0 ... v1.13.0 and v1.14.0-rc.1
// of siderolabs/talos, each kind listed under the first tag that has it (found with
// `git grep 'Kind *= *"' <tag> -- 'pkg/machinery/config/types/*.go'`; v1.3.0 and v1.4.0 have none: one document).
// simnode decodes with pkg/machinery v1.14.1, which knows them all; a node of an earlier release runs its own
// machinery, which does not. A kind missing here (declared another way) is accepted, as before this table.
var kindSince = map[string]int{
	"EventSinkConfig": 5, "KmsgLogConfig": 5, "SideroLinkConfig": 5,
	"NetworkRuleConfig":      6,
	"ExtensionServiceConfig": 7, "WatchdogTimerConfig": 7,
	"KubeSpanEndpointsConfig": 8, "VolumeConfig": 8,
	"EthernetConfig": 10, "UserVolumeConfig": 10,
	"ExistingVolumeConfig": 11, "RawVolumeConfig": 11, "SwapVolumeConfig": 11, "ZswapConfig": 11,
	"BondConfig": 12, "BridgeConfig": 12, "DummyLinkConfig": 12, "HCloudVIPConfig": 12, "HostnameConfig": 12,
	"LinkAliasConfig": 12, "LinkConfig": 12, "OOMConfig": 12, "ResolverConfig": 12, "StaticHostConfig": 12,
	"TimeSyncConfig": 12, "VLANConfig": 12, "WireguardConfig": 12,
	"BlackholeRouteConfig": 13, "EnvironmentConfig": 13, "ExternalVolumeConfig": 13,
	"ImageVerificationConfig": 13, "KubeSpanConfig": 13, "RoutingRuleConfig": 13, "TCPProbeConfig": 13,
	"VRFConfig":         13,
	"BGPInstanceConfig": 14, "CRIBaseRuntimeSpecConfig": 14, "CRICustomizationConfig": 14, "ContainerConfig": 14,
	"DiscoveryIdentityConfig": 14, "DiscoveryServiceConfig": 14, "EtcFileConfig": 14, "FilesystemScrubConfig": 14,
	"FilesystemTrimConfig": 14, "HTTPProbeConfig": 14, "KernelModuleConfig": 14, "LVMLogicalVolumeConfig": 14,
	"LVMVolumeGroupConfig": 14, "RAIDArrayConfig": 14, "SecurityProfileConfig": 14, "SysctlConfig": 14,
	"SysfsConfig": 14, "UdevRulesConfig": 14, "UnattendedInstallConfig": 14, "VethConfig": 14,
}

// unregisteredKind is the error the machinery of a node running release tag gives for the first document of data
// whose kind that release does not register, or nil. Its text is the decoder's wrapping of the registry's error
// (talos@v1.13.0 pkg/machinery/config/configloader/internal/decoder/decoder.go:119-135, document IDs and line as
// there; pkg/machinery/config/internal/registry/registry.go:79, `"<kind>" "<version>": not registered`).
// Checked before the v1.14.1 loader, so a duplicate document before it is reported second, not first.
func unregisteredKind(data []byte, tag string) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))

	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}

			return nil // not ours to report: the loader's own decode error follows
		}

		for _, manifest := range doc.Content {
			if manifest.Kind != yaml.MappingNode {
				continue
			}

			apiVersion, kind, name := field(manifest, "apiVersion"), field(manifest, "kind"), field(manifest, "name")
			since, known := kindSince[kind]

			if known && !atLeast(tag, 1, since) {
				return fmt.Errorf("error decoding document %s/%s/%s (line %d): %q %q: not registered",
					apiVersion, kind, name, manifest.Line, kind, apiVersion)
			}
		}
	}
}

// field is a top-level scalar of a mapping node ("" when absent), as the decoder's findValue reads it.
func field(mapping *yaml.Node, key string) string {
	for i := 0; i+1 < len(mapping.Content); i += 2 {
		if mapping.Content[i].Value == key {
			return mapping.Content[i+1].Value
		}
	}

	return ""
}
