import { type DynamicModule, Module, type Type } from '@nestjs/common';
import { CLIENT_RESOLVER, type ClientResolver } from '../caller-auth/caller';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { MetricsModule } from '../metrics/metrics.module';
import { ProviderModule } from '../provider/provider.module';
import { SecretsModule } from '../secrets/secrets.module';
import { OAuthTokenRoute } from './oauth-token.route';
import { TokenAuditTrail } from './token-audit';
import { TokenFront } from './token-front';
import { TokenService } from './token.service';

/** The store implements this folder's port, so it is handed in by {@link TokenModule.withStore}. */
@Module({
  imports: [ProviderModule, SecretsModule, MetricsModule, CallerAuthModule],
  providers: [
    TokenService,
    TokenAuditTrail,
    TokenFront,
    OAuthTokenRoute,
    {
      // `?client=` as GET /token resolves it, for caller admission on the other routes.
      provide: CLIENT_RESOLVER,
      inject: [TokenService],
      useFactory: (tokens: TokenService): ClientResolver => tokens.resolveClient.bind(tokens),
    },
  ],
  exports: [TokenService, CLIENT_RESOLVER],
})
export class TokenModule {
  static withStore(store: Type): DynamicModule {
    return { module: TokenModule, imports: [store] };
  }
}
