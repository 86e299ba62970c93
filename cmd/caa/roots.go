package main

// The image (`make image`) is the static binary and a user, with no CA
// bundle: Go's x509 falls back to these Mozilla roots, compiled in, when
// the system has none (SSL_CERT_FILE and SSL_CERT_DIR still take
// precedence). The cloud APIs' certificates verify in any container.
import _ "golang.org/x/crypto/x509roots/fallback"
