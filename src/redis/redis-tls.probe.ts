import { connect as connectTcp, type Socket } from 'node:net';
import { connect as connectTls } from 'node:tls';

interface TlsProbeTarget {
  readonly host: string;
  readonly port: number;
  readonly tls: boolean;
  /** SNI (REDIS_TLS_SERVER_NAME), else the host when it is a name. */
  readonly serverName?: string;
  readonly timeoutMs: number;
}

/**
 * Anything but the other protocol answering (refused, timeout, silence) is `false`: an outage,
 * not a mismatch. Certificates are not checked: only whether TLS is spoken at all.
 */
export function speaksOtherProtocol(target: TlsProbeTarget): Promise<boolean> {
  return new Promise((resolve) => {
    let socket: Socket;
    const done = (verdict: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(verdict);
    };
    const timer = setTimeout(() => done(false), target.timeoutMs);
    if (target.tls) {
      socket = connectTcp({ host: target.host, port: target.port }, () => socket.write('PING\r\n'));
      // `+PONG`, or `-NOAUTH ...` from a server with a password: RESP either way.
      socket.once('data', (data: Buffer) => done(data[0] === 0x2b || data[0] === 0x2d));
    } else {
      socket = connectTls(
        {
          host: target.host,
          port: target.port,
          servername: target.serverName,
          rejectUnauthorized: false,
        },
        () => done(true),
      );
    }
    socket.once('error', () => done(false));
    socket.once('close', () => done(false));
  });
}
