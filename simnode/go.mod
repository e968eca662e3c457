module github.com/talos-gpu-runbooks/simnode

go 1.26.5

require (
	github.com/blang/semver/v4 v4.0.0
	github.com/cosi-project/runtime v1.16.3
	github.com/google/go-cmp v0.7.0
	github.com/hashicorp/go-multierror v1.1.1
	github.com/hexops/gotextdiff v1.0.3
	github.com/rs/xid v1.6.0
	github.com/siderolabs/crypto v0.6.5
	github.com/siderolabs/grpc-proxy v0.5.1
	github.com/siderolabs/net v0.4.0
	github.com/siderolabs/talos/pkg/machinery v1.14.1
	go.yaml.in/yaml/v4 v4.0.0-rc.6
	google.golang.org/grpc v1.83.2
	google.golang.org/protobuf v1.36.12
)

require (
	cel.dev/expr v0.25.2 // indirect
	github.com/antlr4-go/antlr/v4 v4.13.1 // indirect
	github.com/containerd/go-cni v1.1.13 // indirect
	github.com/containernetworking/cni v1.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/evanphx/json-patch v5.9.11+incompatible // indirect
	github.com/gertd/go-pluralize v0.2.1 // indirect
	github.com/ghodss/yaml v1.0.0 // indirect
	github.com/google/cel-go v0.31.0 // indirect
	github.com/google/go-containerregistry v0.21.7 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/hashicorp/errwrap v1.1.0 // indirect
	github.com/josharian/native v1.1.0 // indirect
	github.com/jsimonetti/rtnetlink/v2 v2.2.1-0.20260802200809-43bafec815b3 // indirect
	github.com/mdlayher/ethtool v0.6.1 // indirect
	github.com/mdlayher/genetlink v1.4.0 // indirect
	github.com/mdlayher/netlink v1.11.2 // indirect
	github.com/mdlayher/socket v0.6.1 // indirect
	github.com/neticdk/go-stdlib v1.0.1 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	github.com/petermattis/goid v0.0.0-20260713124913-97594f28f5ca // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20260702190614-8ae5a48058df // indirect
	github.com/ryanuber/go-glob v1.0.0 // indirect
	github.com/sasha-s/go-deadlock v0.3.9 // indirect
	github.com/siderolabs/gen v0.8.8 // indirect
	github.com/siderolabs/go-pointer v1.0.1 // indirect
	github.com/siderolabs/protoenc v0.2.4 // indirect
	github.com/stretchr/objx v0.5.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/exp v0.0.0-20260709172345-9ea1abe57597 // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260810153831-ec0a7760b754 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260810153831-ec0a7760b754 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)

// The ethtool fork of talos@v1.13.0:pkg/machinery/go.mod: v1.14.1 replaces it with v0.6.0-sidero, which the module
// proxy refuses (403, 2026-12-02). machinery's network packages import ethtool; they build on the v0.4.0 fork, and
// simnode calls none of them.
replace github.com/mdlayher/ethtool => github.com/siderolabs/ethtool v0.4.0-sidero

// pkg/machinery v1.14.1 requires these versions, which the module proxy refuses (403, 2026-12-02): the nearest it
// serves (tools/build-talosctl.sh SUBSTITUTES, the same for talosctl v1.14.1).
replace github.com/cosi-project/runtime v1.16.3 => github.com/cosi-project/runtime v1.16.2

replace github.com/jsimonetti/rtnetlink/v2 v2.2.1-0.20260802200809-43bafec815b3 => github.com/jsimonetti/rtnetlink/v2 v2.3.0
