// A real, certified OpenID provider (panva/oidc-provider) configured as a site would
// configure Keycloak or Dex for Lattice: the public client `lattice` (device authorization
// grant, authorization code + PKCE with a loopback redirect, refresh tokens), a second
// client `other` (tokens issued to another audience), and accounts whose ID tokens carry
// groups and tenants. Started by Lattice's login tests; not for production.
//
//   node hack/oidc/provider.js            # settings from the environment:
//   PORT=0                    listen port (0: any; the chosen one is printed)
//   KEY_ALG=RS256             RS256, ES256 or EdDSA: the ID token signing key's algorithm
//   KEY_ID=k1                 its kid (restart with another to rotate the key)
//   ID_TOKEN_TTL=3600         ID token lifetime in seconds
//   ACCOUNTS='{"alice": {"groups": ["physics"], "tenants": ["t1"]}}'
//
// Prints `READY <issuer>` once listening. Any login with any password is accepted at the
// provider's own (development) login page.

import crypto from 'node:crypto';
import http from 'node:http';

import Provider from 'oidc-provider';

const alg = process.env.KEY_ALG || 'RS256';
const kid = process.env.KEY_ID || 'k1';
const idTokenTtl = Number(process.env.ID_TOKEN_TTL || 3600);
const accounts = JSON.parse(process.env.ACCOUNTS || '{}');

function signingKey() {
  let pair;
  if (alg === 'RS256') pair = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  else if (alg === 'ES256') pair = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  else if (alg === 'EdDSA') pair = crypto.generateKeyPairSync('ed25519');
  else throw new Error(`KEY_ALG ${alg}: use RS256, ES256 or EdDSA`);
  return { ...pair.privateKey.export({ format: 'jwk' }), kid, alg, use: 'sig' };
}

const server = http.createServer();
await new Promise((resolve) => { server.listen(Number(process.env.PORT || 0), '127.0.0.1', resolve); });
const issuer = `http://127.0.0.1:${server.address().port}`;

const client = (id) => ({
  client_id: id,
  application_type: 'native',
  token_endpoint_auth_method: 'none',
  grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'authorization_code', 'refresh_token'],
  response_types: ['code'],
  redirect_uris: ['http://127.0.0.1/callback'],
  id_token_signed_response_alg: alg,
});

const provider = new Provider(issuer, {
  clients: [client('lattice'), client('other')],
  jwks: { keys: [signingKey()] },
  cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  features: {
    deviceFlow: { enabled: true },
    devInteractions: { enabled: true },
    revocation: { enabled: true },
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups', 'tenants'],
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    email: ['email'],
    groups: ['groups'],
    tenants: ['tenants', 'lattice_role'],
  },
  // The ID token carries the claims of the scopes granted (what Lattice maps users by).
  conformIdTokenClaims: false,
  pkce: { required: () => true, methods: ['S256'] },
  ttl: { IdToken: idTokenTtl, AccessToken: idTokenTtl, DeviceCode: 600, RefreshToken: 86400 },
  // First-party clients: the site has agreed to them, nobody is asked to consent.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid offline_access profile email groups tenants');
    await grant.save();
    return grant;
  },
  async issueRefreshToken(ctx, c) {
    return c.grantTypeAllowed('refresh_token');
  },
  async findAccount(ctx, id) {
    const a = accounts[id] || {};
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          preferred_username: id,
          name: id,
          email: `${id}@example.org`,
          groups: a.groups || [],
          tenants: a.tenants || [],
          ...(a.lattice_role ? { lattice_role: a.lattice_role } : {}),
        };
      },
    };
  },
});
provider.proxy = false;
server.on('request', provider.callback());
console.log(`READY ${issuer}`);

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => server.close(() => process.exit(0)));
}
