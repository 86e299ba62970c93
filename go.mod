module github.com/caa-project/caa

go 1.26

require go.etcd.io/bbolt v1.5.0

require (
	github.com/stretchr/testify v1.12.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.45.0 // indirect
)
