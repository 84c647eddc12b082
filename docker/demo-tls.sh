#!/bin/sh
# Demo certificates for docker/compose.yaml: a private CA, party B's certificate and key, and
# the CA certificate alone for party A -- the steps of docs/DEPLOY.md section 2.
#
#   sh docker/demo-tls.sh PARTY_B_DIR PARTY_A_DIR HOSTNAME...
#
# PARTY_B_DIR gets party_b.crt, party_b.key (mode 600) and ca.crt; PARTY_A_DIR gets ca.crt.
# The certificate names every HOSTNAME (the first is its CN). The CA key is deleted once the
# certificate is signed, so nobody can issue another one under this CA. Nothing is done when
# party_b.crt exists (a restarted compose keeps its certificates).
set -eu
b_dir="$1"
a_dir="$2"
shift 2
if [ -f "$b_dir/party_b.crt" ]; then
    echo "demo-tls: $b_dir/party_b.crt exists; keeping it"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077
san=""
for host in "$@"; do
    san="${san:+$san,}DNS:$host"
done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=FedLite demo CA" -keyout "$work/ca.key" -out "$work/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$work/party_b.key" -out "$work/party_b.csr" 2>/dev/null
printf "subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n" \
    "$san" > "$work/party_b.ext"
openssl x509 -req -in "$work/party_b.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" \
    -CAcreateserial -days 30 -out "$work/party_b.crt" -extfile "$work/party_b.ext" 2>/dev/null
openssl verify -CAfile "$work/ca.crt" "$work/party_b.crt" >/dev/null
cp "$work/ca.crt" "$a_dir/ca.crt"
cp "$work/ca.crt" "$work/party_b.crt" "$work/party_b.key" "$b_dir/"
chmod 644 "$a_dir/ca.crt" "$b_dir/ca.crt" "$b_dir/party_b.crt"  # public; the key stays 600
echo "demo-tls: certificate for $san in $b_dir, its CA in $a_dir"
