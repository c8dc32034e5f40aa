// The suite's OpenID Connect provider: node-oidc-provider 8.8.1 issuing JWT
// access tokens (RFC 9068) for tests/identity/oidc_provider.py, which starts it.
//
//   node provider.js CONFIG   serve on 127.0.0.1:CONFIG.port until SIGTERM
//
// CONFIG (JSON, written by the Python side): port, issuer, kids_file (a JSON
// array of key ids: the first one's key signs, all are published at /jwks),
// keys_dir (each key's private JWK as KID.json, made the first time its kid
// is named), scopes, users, user_client, service_client, service_secret,
// redirect_uri.
//
// Access tokens come for one resource indicator, urn:jetway:api, whose query
// chooses the token's audience and lifetime (?audience=jetway&lifetime=60):
// the tests ask for short-lived tokens and for other audiences without a
// provider of their own. End users sign in through an interaction of our own
// that logs in the known user named by login_hint and consents to everything
// asked, so the authorization-code flow runs over HTTP without a form. The
// provider reaches nothing: no client has a jwks_uri, request_uri or sector
// identifier, and httpOptions refuses any host other than 127.0.0.1.

import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createServer } from 'node:http';
import process from 'node:process';

import Provider, { errors } from 'oidc-provider';

const RESOURCE = 'urn:jetway:api';
const MAX_LIFETIME = 24 * 60 * 60;

// The private JWKs of the kids named, in their order; a kid without a key gets a new one.
function signingKeys(config) {
  return JSON.parse(readFileSync(config.kids_file, 'utf8')).map((kid) => {
    const path = join(config.keys_dir, `${kid}.json`);
    if (!existsSync(path)) {
      const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
      writeFileSync(path, JSON.stringify({ ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' }));
    }
    return JSON.parse(readFileSync(path, 'utf8'));
  });
}

// The audience and lifetime a resource indicator asks for; anything else is invalid_target.
function resourceServer(indicator, scopes) {
  const url = new URL(indicator);
  if (`${url.protocol}${url.pathname}` !== RESOURCE) {
    throw new errors.InvalidTarget(`unknown resource indicator (only ${RESOURCE})`);
  }
  const audience = url.searchParams.get('audience') || 'jetway';
  const lifetime = Number(url.searchParams.get('lifetime') || 3600);
  if (!Number.isInteger(lifetime) || lifetime < 1 || lifetime > MAX_LIFETIME) {
    throw new errors.InvalidTarget(`lifetime must be whole seconds from 1 to ${MAX_LIFETIME}`);
  }
  return {
    scope: scopes.join(' '),
    audience,
    accessTokenTTL: lifetime,
    accessTokenFormat: 'jwt',
    jwt: { sign: { alg: 'RS256' } },
  };
}

function configuration(config) {
  const users = new Set(config.users);
  const tokenTTL = (ctx, token) => token.resourceServer?.accessTokenTTL ?? 3600;
  return {
    clients: [
      {
        client_id: config.user_client,
        token_endpoint_auth_method: 'none', // a public client: PKCE is its proof
        grant_types: ['authorization_code'],
        response_types: ['code'],
        redirect_uris: [config.redirect_uri],
      },
      {
        client_id: config.service_client,
        client_secret: config.service_secret,
        grant_types: ['client_credentials'],
        response_types: [],
        redirect_uris: [],
      },
    ],
    scopes: ['openid', ...config.scopes],
    jwks: { keys: signingKeys(config) },
    cookies: { keys: [randomBytes(32).toString('hex')] },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => RESOURCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, indicator) => resourceServer(indicator, config.scopes),
      },
    },
    findAccount: (ctx, id) => (users.has(id) ? { accountId: id, claims: () => ({ sub: id }) } : undefined),
    ttl: {
      AccessToken: tokenTTL,
      ClientCredentials: tokenTTL,
      AuthorizationCode: 60,
      Interaction: 600,
      Session: 3600,
      Grant: 3600,
    },
    httpOptions(url) {
      if (url.hostname !== '127.0.0.1') throw new Error(`the test provider reaches no ${url.hostname}`);
      return {};
    },
  };
}

// The one interaction: log in the user login_hint names, then grant every scope asked.
async function interact(provider, users, req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params, session } = details;
  let result;
  if (prompt.name === 'login') {
    const user = params.login_hint;
    result = users.has(user)
      ? { login: { accountId: user } }
      : { error: 'access_denied', error_description: `no such user: ${user}` };
  } else {
    const grant = new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
    for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
}

function serve(configPath) {
  const config = JSON.parse(readFileSync(configPath, 'utf8'));
  const provider = new Provider(config.issuer, configuration(config));
  const users = new Set(config.users);
  const callback = provider.callback();
  const server = createServer((req, res) => {
    if (!req.url.startsWith('/interaction/')) return callback(req, res);
    return interact(provider, users, req, res).catch((error) => {
      console.error(error);
      res.statusCode = 500;
      res.end(String(error));
    });
  });
  server.listen(config.port, '127.0.0.1', () => console.log(`listening at ${config.issuer}`));
}

const args = process.argv.slice(2);
if (args.length !== 1) {
  console.error('usage: node provider.js CONFIG');
  process.exit(2);
}
serve(args[0]);
