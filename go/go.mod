module github.com/wirepool/wirepool/go

go 1.24

require go.uber.org/goleak v1.3.0
