module github.com/wirepool/wirepool/bench/incumbents/go-plugin

go 1.26.0

require (
	github.com/hashicorp/go-hclog v1.6.3
	github.com/hashicorp/go-plugin v1.8.0
	github.com/wirepool/wirepool/bench/runners/go v0.0.0
	golang.org/x/sys v0.50.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/fatih/color v1.13.0 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/hashicorp/yamux v0.1.2 // indirect
	github.com/mattn/go-colorable v0.1.12 // indirect
	github.com/mattn/go-isatty v0.0.17 // indirect
	github.com/oklog/run v1.1.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

// The bench's shared helpers (scenario, figures, rows, the founding generator); that module's
// own requirement on the SDK resolves to the repository's go/ too.
replace (
	github.com/wirepool/wirepool/bench/runners/go => ../../runners/go
	github.com/wirepool/wirepool/go => ../../../go
)
