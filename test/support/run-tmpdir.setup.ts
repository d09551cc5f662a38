import { setupRunTmpdir } from './run-tmpdir';

export default setupRunTmpdir;
