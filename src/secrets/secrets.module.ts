import { Module } from '@nestjs/common';
import { AwsSecretReader } from './secret-reader';
import { SECRET_READER } from './secrets.constants';

@Module({
  providers: [{ provide: SECRET_READER, useFactory: () => new AwsSecretReader() }],
  exports: [SECRET_READER],
})
export class SecretsModule {}
