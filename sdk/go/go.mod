module github.com/streamd/streamd/sdk/go

go 1.24.0
