import { teardownRunTmpdir } from './run-tmpdir';

export default teardownRunTmpdir;
