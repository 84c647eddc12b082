#!/bin/sh
# Demo certificates for docker/compose.replicated.yaml: mutual TLS at the load balancer and on
# the hop behind it (docker/haproxy/haproxy.cfg says what each file is for; the openssl steps
# are those of docs/DEPLOY.md section 2, as party_b/ops/certs.py makes them for make replicas).
#
#   sh docker/haproxy/stack-tls.sh LB_DIR REPLICA_DIR PARTY_A_DIR
#
# Two private CAs: the demo CA signs the balancer's server certificate (party-b, localhost)
# and party A's client certificate (subject CN=party-a,O=FedLite demo); the hop CA signs the
# replicas' certificate (party-b-1, party-b-2, localhost; server and client) and the balancer's
# client certificate (CN=fedlite-lb,O=FedLite party B). Each directory gets only what its
# service needs:
#   LB_DIR       lb.pem (certificate + key), client-ca.crt, hop-ca.crt, lb-hop.pem
#   REPLICA_DIR  replica.crt, replica.key, hop-ca.crt
#   PARTY_A_DIR  ca.crt, party_a.crt, party_a.key
# Keys are mode 600; both CA keys are deleted once everything is signed. Nothing is done when
# LB_DIR/lb.pem exists (a restarted compose keeps its certificates).
set -eu
lb_dir="$1"
replica_dir="$2"
a_dir="$3"
if [ -f "$lb_dir/lb.pem" ]; then
    echo "stack-tls: $lb_dir/lb.pem exists; keeping the certificates"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077
curve="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

ca() {  # ca NAME "COMMON NAME"
    # shellcheck disable=SC2086
    openssl req -x509 $curve -days 30 -subj "/CN=$2" -keyout "$work/$1.key" \
        -out "$work/$1.crt" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

sign() {  # sign CA NAME SUBJECT USAGES [SAN]
    # shellcheck disable=SC2086
    openssl req $curve -subj "$3" -keyout "$work/$2.key" -out "$work/$2.csr" 2>/dev/null
    printf "extendedKeyUsage=%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n" \
        "$4" > "$work/$2.ext"
    if [ -n "${5:-}" ]; then
        printf "subjectAltName=%s\n" "$5" >> "$work/$2.ext"
    fi
    openssl x509 -req -in "$work/$2.csr" -CA "$work/$1.crt" -CAkey "$work/$1.key" \
        -CAcreateserial -days 30 -out "$work/$2.crt" -extfile "$work/$2.ext" 2>/dev/null
    openssl verify -CAfile "$work/$1.crt" "$work/$2.crt" >/dev/null
}

ca ca "FedLite demo CA"
ca hop-ca "FedLite party B hop CA"
sign ca lb "/CN=party-b" serverAuth "DNS:party-b,DNS:localhost"
sign ca party_a "/O=FedLite demo/CN=party-a" clientAuth
sign hop-ca replica "/CN=party-b-replica" serverAuth,clientAuth \
    "DNS:party-b-1,DNS:party-b-2,DNS:localhost"
sign hop-ca lb-hop "/O=FedLite party B/CN=fedlite-lb" clientAuth

cat "$work/lb.crt" "$work/lb.key" > "$lb_dir/lb.pem"
cat "$work/lb-hop.crt" "$work/lb-hop.key" > "$lb_dir/lb-hop.pem"
cp "$work/ca.crt" "$lb_dir/client-ca.crt"
cp "$work/hop-ca.crt" "$lb_dir/hop-ca.crt"
cp "$work/replica.crt" "$work/replica.key" "$work/hop-ca.crt" "$replica_dir/"
cp "$work/ca.crt" "$work/party_a.crt" "$work/party_a.key" "$a_dir/"
chmod 644 "$lb_dir/client-ca.crt" "$lb_dir/hop-ca.crt" "$replica_dir/replica.crt" \
    "$replica_dir/hop-ca.crt" "$a_dir/ca.crt" "$a_dir/party_a.crt"  # public; keys stay 600
echo "stack-tls: the balancer's files in $lb_dir, the replicas' in $replica_dir, party A's in $a_dir"
