#!/usr/bin/env python3
"""Logs in to the test OpenID provider (hack/oidc/provider.js) with the device flow, as a
person at a browser would, and prints the ID token: how the benchmarks get an OIDC token
without a person. Standard library only.

    hack/oidc/device-login.py ISSUER LOGIN [CLIENT_ID] [SCOPES]
"""

import html
import http.cookiejar
import json
import re
import sys
import time
import urllib.parse
import urllib.request


def post(opener, url, fields):
    data = urllib.parse.urlencode(fields).encode()
    with opener.open(urllib.request.Request(url, data=data)) as r:
        return r.geturl(), r.read().decode()


def token_request(url, fields):
    req = urllib.request.Request(url, data=urllib.parse.urlencode(fields).encode())
    try:
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def main():
    issuer, login = sys.argv[1], sys.argv[2]
    client = sys.argv[3] if len(sys.argv) > 3 else "lattice"
    scopes = sys.argv[4] if len(sys.argv) > 4 else "openid offline_access profile groups tenants"
    with urllib.request.urlopen(issuer + "/.well-known/openid-configuration") as r:
        doc = json.loads(r.read())
    start = token_request(doc["device_authorization_endpoint"], {"client_id": client, "scope": scopes})
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(start["verification_uri_complete"]) as r:
        url, page = r.geturl(), r.read().decode()
    # Submit each form the provider shows (the code confirmation, the login) until none is left.
    for _ in range(12):
        form = re.search(r"<form[^>]*action=\"([^\"]*)\"[^>]*>(.*?)</form>", page, re.S)
        if not form:
            break
        fields = {}
        for tag in re.findall(r"<input[^>]*>", form.group(2)):
            name = re.search(r'name="([^"]*)"', tag)
            if not name:
                continue
            value = re.search(r'value="([^"]*)"', tag)
            fields[name.group(1)] = html.unescape(value.group(1)) if value else ""
        if "login" in fields:
            fields["login"], fields["password"] = login, "any"
        url, page = post(opener, urllib.parse.urljoin(url, html.unescape(form.group(1))), fields)
    for _ in range(30):
        tokens = token_request(
            doc["token_endpoint"],
            {
                "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
                "device_code": start["device_code"],
                "client_id": client,
            },
        )
        if "id_token" in tokens:
            print(tokens["id_token"])
            return
        if tokens.get("error") != "authorization_pending":
            sys.exit(f"device-login: {tokens}")
        time.sleep(1)
    sys.exit("device-login: the login was never confirmed")


if __name__ == "__main__":
    main()
