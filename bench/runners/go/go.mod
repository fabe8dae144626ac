module github.com/wirepool/wirepool/bench/runners/go

go 1.26.0

require (
	github.com/wirepool/wirepool/go v0.0.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/fxamacker/cbor/v2 v2.10.0 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	github.com/x448/float16 v0.8.4 // indirect
)

replace github.com/wirepool/wirepool/go => ../../../go
