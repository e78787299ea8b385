#!/bin/sh
# make-certs.sh OUT_DIR NAME... : a private CA and one server certificate for a pagesift pair.
#
#   OUT_DIR/ca.pem    the CA: clients pass it as --tls-ca, both nodes as replication_ca
#                     (a standby verifies its primary with it), the health probe as
#                     PAGESIFT_HEALTH_CA
#   OUT_DIR/ca.key    the CA's key: keep it OFF the nodes (only this script needs it)
#   OUT_DIR/node.pem  the certificate both nodes serve (tls_cert) ...
#   OUT_DIR/node.key  ... and its key (tls_key), mode 600
#
# NAME: every DNS name or IP address a peer or a client dials: each node's --advertise
# host, the primary Service's name, and "localhost" for the health probe. Example (compose):
#   sh deploy/make-certs.sh deploy/secrets node-a node-b localhost 127.0.0.1
# It refuses to overwrite an existing CA. Certificates are read at start-up: after
# replacing node.pem/node.key, restart each node (standby first).
# Already have a PKI (cert-manager, Vault...)? Use it instead: a serverAuth
# certificate with those names, and its CA, are all pagesift needs.
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: $0 OUT_DIR NAME... (DNS names or IP addresses in the certificate)" >&2
    exit 2
fi
out=$1
shift
mkdir -p "$out"
umask 077
if [ -e "$out/ca.pem" ]; then
    echo "$out/ca.pem exists: not replacing the pair's CA" >&2
    exit 1
fi

san=""
for name in "$@"; do
    case $name in
        *[!0-9.]*) case $name in *:*) kind=IP ;; *) kind=DNS ;; esac ;;
        *) kind=IP ;;
    esac
    san="${san:+$san,}$kind:$name"
done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$out/ca.key" -out "$out/ca.pem" -days 3650 -subj "/CN=pagesift pair CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$out/node.key" -out "$out/node.csr" -subj "/CN=$1" 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' \
    "$san" >"$out/node.ext"
openssl x509 -req -in "$out/node.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
    -out "$out/node.pem" -days 825 -extfile "$out/node.ext" 2>/dev/null
rm -f "$out/node.csr" "$out/node.ext" "$out/ca.srl"
chmod 644 "$out/ca.pem" "$out/node.pem"
echo "wrote $out/ca.pem, $out/ca.key (keep offline), $out/node.pem, $out/node.key for: $san"
