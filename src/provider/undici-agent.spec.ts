import * as undici from 'undici';
import { Agent, errors } from './undici-agent';

describe('undici-agent', () => {
  it("exports undici's own Agent and errors, as its index does", () => {
    expect(Agent).toBe(undici.Agent);
    expect(errors).toBe(undici.errors);
  });

  it("gives agents the request() undici's index adds, without loading the index", async () => {
    let agent: InstanceType<typeof Agent> | undefined;
    // A fresh module registry, where undici's index is not loaded: undici-agent alone, as in
    // the bundle (this fails if undici-agent leaves request() to the index).
    jest.isolateModules(() => {
      const isolated = jest.requireActual<typeof import('./undici-agent')>('./undici-agent');
      agent = new isolated.Agent();
    });
    try {
      expect(typeof agent?.request).toBe('function');
    } finally {
      await agent?.close();
    }
  });
});
