import { Module } from '@nestjs/common';
import { AwsSecretReader, SECRET_READER } from './secret-reader';

@Module({
  providers: [{ provide: SECRET_READER, useFactory: () => new AwsSecretReader() }],
  exports: [SECRET_READER],
})
export class SecretsModule {}
