import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** PEM files of a throwaway CA, a server certificate for 127.0.0.1 and a client certificate. */
export interface TestCertificates {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  /** The client certificate's subject, as RFC 4514 text (`CN=<name>`). */
  clientSubject: string;
  /** A client certificate from the same CA with another subject (`CN=another-client`). */
  otherCert: string;
  otherKey: string;
}

/**
 * Makes the certificates of a mutual-TLS test with `openssl`, in `dir` (the test's temporary
 * directory): one CA signs the server's (SAN IP 127.0.0.1), the client's and another client's.
 */
export function makeTestCertificates(dir: string, clientName = 'broker-client'): TestCertificates {
  const file = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
  const key = (name: string) =>
    openssl(
      'genpkey',
      '-algorithm',
      'EC',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-out',
      file(name),
    );
  key('ca.key');
  openssl(
    'req',
    '-x509',
    '-new',
    '-key',
    file('ca.key'),
    '-subj',
    '/CN=token-broker test CA',
    '-days',
    '2',
    '-out',
    file('ca.pem'),
  );
  const issue = (name: string, subject: string, extensions: string) => {
    key(`${name}.key`);
    openssl(
      'req',
      '-new',
      '-key',
      file(`${name}.key`),
      '-subj',
      subject,
      '-out',
      file(`${name}.csr`),
    );
    writeFileSync(file(`${name}.ext`), extensions);
    openssl(
      'x509',
      '-req',
      '-in',
      file(`${name}.csr`),
      '-CA',
      file('ca.pem'),
      '-CAkey',
      file('ca.key'),
      '-CAcreateserial',
      '-days',
      '2',
      '-extfile',
      file(`${name}.ext`),
      '-out',
      file(`${name}.pem`),
    );
  };
  issue('server', '/CN=127.0.0.1', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  issue('client', `/CN=${clientName}`, 'extendedKeyUsage=clientAuth\n');
  // Same CA, another subject: a certificate the server trusts but registered for no client.
  issue('other', '/CN=another-client', 'extendedKeyUsage=clientAuth\n');
  return {
    ca: file('ca.pem'),
    serverCert: file('server.pem'),
    serverKey: file('server.key'),
    clientCert: file('client.pem'),
    clientKey: file('client.key'),
    clientSubject: `CN=${clientName}`,
    otherCert: file('other.pem'),
    otherKey: file('other.key'),
  };
}
