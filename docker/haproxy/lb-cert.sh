#!/bin/sh
# lb-cert.sh CERT KEY PEM: write certificate and key into one PEM file for HAProxy (mode 600),
# unless PEM exists. Used by docker/compose.replicated.yaml.
set -eu
cert="$1"
key="$2"
pem="$3"
if [ -f "$pem" ]; then
    echo "$pem exists; keeping it"
    exit 0
fi
umask 077
cat "$cert" "$key" > "$pem.partial"
mv "$pem.partial" "$pem"
echo "wrote $pem"
